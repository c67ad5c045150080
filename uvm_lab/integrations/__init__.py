"""Earlier home of :mod:`uvm_lab.allocators` (RMM's layout); its names are still importable from here."""
