"""relpos: position information in Transformer attention (Shaw et al. 2018 and successors)."""
