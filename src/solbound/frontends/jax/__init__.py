"""The JAX frontend: ``jax.make_jaxpr`` on abstract values, lowered primitive by primitive
into the loop IR (``lower.py``; rules in ``rules.py``), validated against the function run
by JAX on the CPU (``reference.py``). Importing it needs jax (``pip install 'solbound[jax]'``)."""
