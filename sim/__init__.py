"""Discrete-event fleet simulator driving the same ``phaseroute.streams.policy`` code as the live control plane."""
