"""Facts and readings about the host machine (CPU, memory, disks, network)."""
