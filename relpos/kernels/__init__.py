"""Attention kernels: pure functions of queries, keys, values and position terms.

  distances  clipped relative distances; gathering and summing by them (custom gradients)
  fused      attention through jax.nn.dot_product_attention (cuDNN), a^K as its bias
  relative   the Shaw et al. kernel with a bias; chooses XLA or cuDNN (`implementation`)
"""
