"""Pure decisions (no I/O, no Faust, no clock reads: time is an argument) shared by the live agents and the simulator."""
