"""Profiler traces (torch.profiler / Kineto) read into summaries the diagnosis can judge."""
