import not_a_real_module_xyz  # noqa: F401
