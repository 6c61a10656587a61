"""The appliance service: the process that owns the pooled memory, its control protocol, the ops
it serves, its run directory and the timing of every attached host's traffic."""
