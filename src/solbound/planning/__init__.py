"""Training plans at cluster scale: profiles of a traced step, memory per rank, search."""
