"""One emulated host: its QEMU command line and binary, the boot options, the serial console,
the QMP monitor, what the guest discovered, and error injection."""
