"""What a guest boots: the kernel (setup's, a Debian package or the user's own) and the
initramfs or Debian image built from it with pfcxl's guest programs."""

# the guest images a boot can use (initramfs.py); here so that the CLI's parser reads it light
IMAGE_KINDS = ("busybox", "debian")
DEFAULT_IMAGE = "busybox"           # small, and every guest tool but the Python binding
