"""The engine: the round loop, the method's arithmetic, the scheduler, settings and limits."""
