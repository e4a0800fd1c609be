"""Pure data-parallel decisions: routing policies, coordinator stats and waves, MoE lockstep. No I/O, no clocks."""
