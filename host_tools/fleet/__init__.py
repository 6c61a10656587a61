"""Several machines at once: hosts on one appliance (`pfcxl multihost`) and machines that stay
up between commands (`pfcxl up`, `exec`, `ps`, `down`)."""
