"""Facts of the CXL/PCIe specifications and of QEMU 10's behaviour, each written once; read by
the topology rules, the fabric figures and the firmware table builders alike."""
