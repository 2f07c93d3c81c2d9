"""`phaseroute demo`: the whole stack end to end on this machine."""
