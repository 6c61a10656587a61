"""What a guest boots: the kernel (setup's, a Debian package or the user's own) and the
initramfs or Debian image built from it with pfcxl's guest programs."""
