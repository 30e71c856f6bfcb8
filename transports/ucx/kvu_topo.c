/*
 * kvu_topo.c - device placement: which NIC is nearest a rank's GPU (hwloc),
 * and what kind of memory a pointer is (HIP).
 *
 * Both take their inputs through seams so that tests can run without the
 * hardware: an hwloc XML topology file, and a HIP build that reports "no
 * device" clearly on a machine without one.
 */
#include "kvu.h"

#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#ifdef KVX_HAVE_HIP
#include <hip/hip_runtime_api.h>
#endif

int kvu_hip_mem_type(const void *ptr)
{
#ifdef KVX_HAVE_HIP
    hipPointerAttribute_t attr;
    int                   count = 0;

    if (hipGetDeviceCount(&count) != hipSuccess || count == 0) {
        kvc_error(KVX_ERR_DEVICE, "HIP: no ROCm device present");
        return -1;
    }
    memset(&attr, 0, sizeof(attr));
    if (hipPointerGetAttributes(&attr, ptr) != hipSuccess) {
        return 0;
    }
#if HIP_VERSION_MAJOR >= 6
    return attr.type == hipMemoryTypeDevice ? 1 : 0;
#else
    return attr.memoryType == hipMemoryTypeDevice ? 1 : 0;
#endif
#else
    (void)ptr;
    kvc_error(KVX_ERR_DEVICE, "HIP support was not compiled in (-Dhip)");
    return -1;
#endif
}

static int kvu_topo_is_net(hwloc_obj_t os)
{
    return os->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK ||
           os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS;
}

/* Distance between two objects: depth of the tree above their common
 * ancestor (smaller = closer). */
static int kvu_topo_distance(hwloc_topology_t topo, hwloc_obj_t a,
                             hwloc_obj_t b)
{
    hwloc_obj_t anc = hwloc_get_common_ancestor_obj(topo, a, b);
    int         d   = 0;

    for (hwloc_obj_t o = a; o != NULL && o != anc; o = o->parent) {
        d++;
    }
    for (hwloc_obj_t o = b; o != NULL && o != anc; o = o->parent) {
        d++;
    }
    return d;
}

static hwloc_obj_t kvu_topo_find_pci(hwloc_topology_t topo, const char *busid)
{
    unsigned dom = 0, bus = 0, dev = 0, func = 0;

    if (sscanf(busid, "%x:%x:%x.%x", &dom, &bus, &dev, &func) != 4) {
        return NULL;
    }
    return hwloc_get_pcidev_by_busid(topo, dom, bus, dev, func);
}

static kvx_status_t kvu_topo_load(const char *xml_path, hwloc_topology_t *t)
{
    if (hwloc_topology_init(t) != 0) {
        return kvc_error(KVX_ERR_INTERNAL, "hwloc_topology_init failed");
    }
    hwloc_topology_set_io_types_filter(*t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml_path != NULL && hwloc_topology_set_xml(*t, xml_path) != 0) {
        hwloc_topology_destroy(*t);
        return kvc_error(KVX_ERR_CONFIG, "hwloc topology '%s': cannot read",
                         xml_path);
    }
    if (hwloc_topology_load(*t) != 0) {
        hwloc_topology_destroy(*t);
        return kvc_error(KVX_ERR_INTERNAL, "hwloc_topology_load failed");
    }
    return KVX_OK;
}

kvx_status_t kvu_topo_pick_nic(const char *xml_path, const char *gpu_busid,
                               char *buf, size_t len)
{
    hwloc_topology_t topo;
    hwloc_obj_t      ref = NULL, best = NULL;
    int              best_d = 1 << 30;
    kvx_status_t     status = kvu_topo_load(xml_path, &topo);

    if (status != KVX_OK) {
        return status;
    }
    if (gpu_busid != NULL) {
        ref = kvu_topo_find_pci(topo, gpu_busid);
        if (ref == NULL) {
            hwloc_topology_destroy(topo);
            return kvc_error(KVX_ERR_CONFIG,
                             "gpu bus id '%s': not found in the topology",
                             gpu_busid);
        }
    } else {
        ref = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, 0);
        if (ref == NULL) {
            ref = hwloc_get_root_obj(topo);
        }
    }
    for (hwloc_obj_t os = hwloc_get_next_osdev(topo, NULL); os != NULL;
         os = hwloc_get_next_osdev(topo, os)) {
        int d;

        if (!kvu_topo_is_net(os) || os->name == NULL) {
            continue;
        }
        d = kvu_topo_distance(topo, ref, os);
        /* Prefer RDMA (OpenFabrics) devices at equal distance. */
        if (d < best_d || (d == best_d && best != NULL &&
                           os->attr->osdev.type ==
                               HWLOC_OBJ_OSDEV_OPENFABRICS &&
                           best->attr->osdev.type !=
                               HWLOC_OBJ_OSDEV_OPENFABRICS)) {
            best   = os;
            best_d = d;
        }
    }
    if (best == NULL) {
        hwloc_topology_destroy(topo);
        return kvc_error(KVX_ERR_NOT_FOUND, "no network device in topology");
    }
    snprintf(buf, len, "%s", best->name);
    hwloc_topology_destroy(topo);
    return KVX_OK;
}
