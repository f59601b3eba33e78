"""What runs the book's code: the device choice, launchers, timing, background programs, the network
guard."""
