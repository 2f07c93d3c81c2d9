"""Command line: ``phaseroute up|down|topics|demo|worker|submit|...`` (entry point: ``main.app``)."""
