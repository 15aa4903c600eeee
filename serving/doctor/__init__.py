"""`python -m serving doctor`: watch a live server's metrics over a window and
name the likely causes of "timeouts at peak while the accelerator idles",
each with its evidence."""
