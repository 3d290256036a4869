"""Hot-path kernels behind one function each, with a reference to test against."""
