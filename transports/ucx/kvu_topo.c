/*
 * kvu_topo.c - device placement: which NIC is nearest a rank's GPU (hwloc),
 * and what kind of memory a pointer is (HIP).
 *
 * Both take their inputs through seams so that tests can run without the
 * hardware: an hwloc XML topology file, and a HIP build that reports "no
 * device" clearly on a machine without one.
 */
#include "kvu.h"

#include "pci.h"

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- hwloc placement ----------------------------------------------------- */

/* Deepest hwloc tree handled; real topologies are far shallower. */
#define KVU_TOPO_MAX_DEPTH 256

static int kvu_topo_is_rdma(hwloc_obj_t os)
{
    return os->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS;
}

static int kvu_topo_is_net(hwloc_obj_t os)
{
    return os->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK ||
           kvu_topo_is_rdma(os);
}

static int kvu_topo_empty(const char *s)
{
    return s == NULL || s[0] == '\0';
}

/* kvu_topo_chain lists obj and its ancestors, root last; returns the count.
 * Parent pointers are used rather than hwloc_get_common_ancestor_obj(),
 * which compares depths and so does not work for I/O and memory objects
 * (their depths are negative "virtual" depths). */
static int kvu_topo_chain(hwloc_obj_t obj, hwloc_obj_t *chain)
{
    int n = 0;

    for (; obj != NULL && n < KVU_TOPO_MAX_DEPTH; obj = obj->parent) {
        chain[n++] = obj;
    }
    return n;
}

/* kvu_topo_closeness says how near os is to the reference whose ancestor
 * chain is ref[0..nref) (ref[nref-1] is the root): *level is the depth below
 * the root of their nearest common ancestor (larger = nearer), *hops the
 * number of steps from os up to it. */
static void kvu_topo_closeness(hwloc_obj_t *ref, int nref, hwloc_obj_t os,
                               int *level, int *hops)
{
    *level = 0;
    *hops  = 0;
    for (hwloc_obj_t o = os; o != NULL; o = o->parent, (*hops)++) {
        for (int i = 0; i < nref; i++) {
            if (ref[i] == o) {
                *level = nref - 1 - i;
                return;
            }
        }
    }
}

/* kvu_topo_busid finds the PCI device of busid in topo. */
static kvx_status_t kvu_topo_busid(hwloc_topology_t topo, const char *xml_path,
                                   const char *busid, hwloc_obj_t *out)
{
    unsigned dom, bus, dev, func;

    if (kvc_busid_parse(busid, &dom, &bus, &dev, &func) != 0) {
        return kvc_error(KVX_ERR_CONFIG,
                         "gpu bus id '%s': not a PCI bus id "
                         "(dddd:bb:dd.f or bb:dd.f)", busid);
    }
    *out = hwloc_get_pcidev_by_busid(topo, dom, bus, dev, func);
    if (*out == NULL) {
        return kvc_error(KVX_ERR_CONFIG,
                         "gpu bus id '%s': no such PCI device in the "
                         "topology of %s", busid,
                         kvu_topo_empty(xml_path) ? "this machine" : xml_path);
    }
    return KVX_OK;
}

/* Discovery components not wanted for this machine's topology. */
static const char *const kvu_topo_skip[] = {
    "pci", "opencl", "cuda", "nvml", "rsmi", "levelzero", "gl"};

#define KVU_TOPO_XML_MAX (64u << 20) /* bytes of an XML topology file */

/* kvu_topo_read reads xml_path into a NUL-terminated buffer (caller frees)
 * without its XML comments and with the root element right after the
 * header lines. hwloc parses it with its built-in reader when its libxml
 * plugin cannot load (the library dlopen'ed with RTLD_LOCAL: the plugin
 * does not see hwloc's symbols), and that reader takes neither comments nor
 * anything else between the DOCTYPE line and the root element. */
static kvx_status_t kvu_topo_read(const char *xml_path, char **buf_p,
                                  size_t *len_p)
{
    FILE       *f = fopen(xml_path, "rb");
    char       *buf, *c, *w;
    const char *r;
    size_t      len;

    if (f == NULL) {
        return kvc_error(KVX_ERR_CONFIG, "hwloc topology '%s': cannot open "
                         "it: %s", xml_path, strerror(errno));
    }
    buf = malloc(KVU_TOPO_XML_MAX + 1);
    len = buf != NULL ? fread(buf, 1, KVU_TOPO_XML_MAX + 1, f) : 0;
    fclose(f);
    if (buf == NULL) {
        return kvc_error(KVX_ERR_NO_MEMORY, "hwloc topology: out of memory");
    }
    if (len > KVU_TOPO_XML_MAX) {
        free(buf);
        return kvc_error(KVX_ERR_CONFIG, "hwloc topology '%s': larger than "
                         "%u bytes", xml_path, KVU_TOPO_XML_MAX);
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len) != NULL) {
        free(buf);
        return kvc_error(KVX_ERR_CONFIG, "hwloc topology '%s': cannot read "
                         "it as an hwloc XML topology (binary data)",
                         xml_path);
    }
    /* drop the comments */
    for (r = buf, w = buf; *r != '\0';) {
        if (strncmp(r, "<!--", 4) == 0) {
            const char *end = strstr(r + 4, "-->");

            r = end != NULL ? end + 3 : r + strlen(r);
            continue;
        }
        *w++ = *r++;
    }
    *w = '\0';
    /* the built-in reader wants the root element right after the lines of
     * the XML declaration and the DOCTYPE */
    c = buf + strspn(buf, " \t\r\n");
    while (strncmp(c, "<?xml ", 6) == 0 || strncmp(c, "<!DOCTYPE ", 10) == 0) {
        char *nl = strchr(c, '\n');

        if (nl == NULL) {
            break;
        }
        c = nl + 1;
    }
    memmove(c, c + strspn(c, " \t\r\n"), strlen(c + strspn(c, " \t\r\n")) + 1);
    len = strlen(buf);
    *buf_p = buf;
    *len_p = len;
    return KVX_OK;
}

/* kvu_topo_load loads the topology of xml_path (NULL or "": this machine)
 * with the important I/O objects (PCI devices, bridges, OS devices). */
static kvx_status_t kvu_topo_load(const char *xml_path, hwloc_topology_t *t)
{
    if (!kvu_topo_empty(xml_path)) {
        char        *buf = NULL;
        size_t       len = 0;
        kvx_status_t st  = kvu_topo_read(xml_path, &buf, &len);

        if (st != KVX_OK) {
            return st;
        }
        if (len >= INT_MAX || hwloc_topology_init(t) != 0) {
            free(buf);
            return kvc_error(KVX_ERR_NO_MEMORY, "hwloc_topology_init failed");
        }
        hwloc_topology_set_io_types_filter(*t,
                                           HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        if (hwloc_topology_set_xmlbuffer(*t, buf, (int)len + 1) != 0 ||
            hwloc_topology_load(*t) != 0) {
            free(buf);
            hwloc_topology_destroy(*t);
            return kvc_error(KVX_ERR_CONFIG,
                             "hwloc topology '%s': cannot read it as an "
                             "hwloc XML topology", xml_path);
        }
        free(buf);
        return KVX_OK;
    }
    if (hwloc_topology_init(t) != 0) {
        return kvc_error(KVX_ERR_NO_MEMORY, "hwloc_topology_init failed");
    }
    hwloc_topology_set_io_types_filter(*t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    /* The Linux backend finds PCI devices, bridges, network and
     * OpenFabrics devices in sysfs, which is all the placement needs. The
     * GPU-runtime components (OpenCL, CUDA, NVML, ROCm SMI, Level Zero,
     * X11/GL) would only initialise vendor runtimes inside the serving
     * process, and the libpciaccess component ("pci") reads the same sysfs
     * again and leaks on every load (hwloc 2.9, Debian 12). Best effort: a
     * component that is not installed is simply not there. */
    for (size_t i = 0; i < sizeof(kvu_topo_skip) / sizeof(kvu_topo_skip[0]);
         i++) {
        (void)hwloc_topology_set_components(
            *t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, kvu_topo_skip[i]);
    }
    if (hwloc_topology_load(*t) != 0) {
        hwloc_topology_destroy(*t);
        return kvc_error(KVX_ERR_INTERNAL,
                         "hwloc: cannot load this machine's topology");
    }
    return KVX_OK;
}

/* kvu_topo_check_buf validates the output buffer. */
static kvx_status_t kvu_topo_check_buf(const char *what, const char *buf,
                                       size_t len)
{
    if (buf == NULL || len == 0) {
        return kvc_error(KVX_ERR_INVALID_PARAM, "%s: no output buffer", what);
    }
    return KVX_OK;
}

/* kvu_topo_port returns the first active port of an OpenFabrics device
 * (hwloc info "Port<N>State" = 4, IB_PORT_ACTIVE), else 1. */
static unsigned kvu_topo_port(hwloc_obj_t os)
{
    unsigned best = 0;

    for (unsigned i = 0; i < os->infos_count; i++) {
        unsigned port = 0;
        int      end  = 0;

        if (os->infos[i].name == NULL || os->infos[i].value == NULL ||
            sscanf(os->infos[i].name, "Port%uState%n", &port, &end) != 1 ||
            os->infos[i].name[end] != '\0' || end == 0) {
            continue;
        }
        if (strcmp(os->infos[i].value, "4") == 0 && port > 0 &&
            (best == 0 || port < best)) {
            best = port;
        }
    }
    return best != 0 ? best : 1;
}

kvx_status_t kvu_topo_pick_nic(const char *xml_path, const char *gpu_busid,
                               char *buf, size_t len)
{
    hwloc_topology_t topo;
    hwloc_obj_t      ref = NULL, best = NULL;
    hwloc_obj_t      chain[KVU_TOPO_MAX_DEPTH];
    int              nchain, best_level = -1, best_hops = 0, n;
    kvx_status_t     status = kvu_topo_check_buf("kvu_topo_pick_nic", buf,
                                                 len);

    if (status == KVX_OK) {
        status = kvu_topo_load(xml_path, &topo);
    }
    if (status != KVX_OK) {
        return status;
    }
    if (!kvu_topo_empty(gpu_busid)) {
        status = kvu_topo_busid(topo, xml_path, gpu_busid, &ref);
    } else {
        ref = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, 0);
        if (ref == NULL) {
            ref = hwloc_get_root_obj(topo);
        }
    }
    if (status != KVX_OK) {
        hwloc_topology_destroy(topo);
        return status;
    }
    nchain = kvu_topo_chain(ref, chain);
    for (hwloc_obj_t os = hwloc_get_next_osdev(topo, NULL); os != NULL;
         os = hwloc_get_next_osdev(topo, os)) {
        int level, hops, better;

        if (!kvu_topo_is_net(os) || os->name == NULL || os->name[0] == '\0') {
            continue;
        }
        kvu_topo_closeness(chain, nchain, os, &level, &hops);
        if (best == NULL || level != best_level) {
            better = best == NULL || level > best_level;
        } else if (kvu_topo_is_rdma(os) != kvu_topo_is_rdma(best)) {
            better = kvu_topo_is_rdma(os);
        } else {
            better = hops < best_hops;
        }
        if (better) {
            best       = os;
            best_level = level;
            best_hops  = hops;
        }
    }
    if (best == NULL) {
        hwloc_topology_destroy(topo);
        return kvc_error(KVX_ERR_NOT_FOUND,
                         "no network device in the topology of %s",
                         kvu_topo_empty(xml_path) ? "this machine" : xml_path);
    }
    if (kvu_topo_is_rdma(best)) {
        n = snprintf(buf, len, "%s:%u", best->name, kvu_topo_port(best));
    } else {
        n = snprintf(buf, len, "%s", best->name);
    }
    hwloc_topology_destroy(topo);
    if (n < 0 || (size_t)n >= len) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "kvu_topo_pick_nic: %zu bytes are too few for the "
                         "device name (%d)", len, n);
    }
    return KVX_OK;
}

kvx_status_t kvu_topo_cpuset(const char *xml_path, const char *gpu_busid,
                             char *buf, size_t len)
{
    hwloc_topology_t topo;
    hwloc_obj_t      obj = NULL;
    int              n;
    kvx_status_t     status = kvu_topo_check_buf("kvu_topo_cpuset", buf, len);

    if (status == KVX_OK) {
        status = kvu_topo_load(xml_path, &topo);
    }
    if (status != KVX_OK) {
        return status;
    }
    if (!kvu_topo_empty(gpu_busid)) {
        status = kvu_topo_busid(topo, xml_path, gpu_busid, &obj);
        if (status == KVX_OK) {
            obj = hwloc_get_non_io_ancestor_obj(topo, obj);
        }
    } else {
        obj = hwloc_get_root_obj(topo);
    }
    if (status == KVX_OK && (obj == NULL || obj->cpuset == NULL)) {
        status = kvc_error(KVX_ERR_INTERNAL,
                           "hwloc: no CPU set above gpu bus id '%s'",
                           kvu_topo_empty(gpu_busid) ? "-" : gpu_busid);
    }
    if (status != KVX_OK) {
        hwloc_topology_destroy(topo);
        return status;
    }
    n = hwloc_bitmap_list_snprintf(buf, len, obj->cpuset);
    hwloc_topology_destroy(topo);
    if (n < 0 || (size_t)n >= len) {
        return kvc_error(KVX_ERR_INVALID_PARAM,
                         "kvu_topo_cpuset: %zu bytes are too few for the CPU "
                         "set (%d)", len, n);
    }
    return KVX_OK;
}
