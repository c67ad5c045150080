"""Letting other libraries allocate through uvm_lab's resources (each integration imports its library lazily)."""
