"""No position information: attention sees a bag of tokens (Shaw et al. 2018, Table 3)."""
from relpos.variants import interface


@interface.register("none")
class NoPosition(interface.Variant):
  """Adds nothing: the interface's defaults."""
