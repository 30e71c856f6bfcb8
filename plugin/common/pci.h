/*
 * pci.h - PCI bus ids (shared by the config parser and device placement).
 */
#ifndef KVC_PCI_H
#define KVC_PCI_H

/* kvc_busid_parse reads a PCI bus id "dddd:bb:dd.f" or "bb:dd.f"
 * (domain 0): exactly 4, 2, 2 and 1 hex digits (any case), device <= 0x1f,
 * function <= 7, nothing else (no white space). 0 on success, -1 if s does
 * not have that form; out pointers may be NULL. */
int kvc_busid_parse(const char *s, unsigned *domain, unsigned *bus,
                    unsigned *dev, unsigned *func);

#endif
