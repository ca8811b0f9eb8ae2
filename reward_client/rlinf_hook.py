"""Old import path of `reward_client.rlinf.hook`, kept for patched RLinf checkouts and existing code.

The module object itself is aliased (not a star re-export), so private names, isinstance checks and
monkeypatching see one module.
"""

import sys

import reward_client.rlinf.hook as _moved

sys.modules[__name__] = _moved
