"""Moved to ``minipaged.paged.paged_attention`` (0.2); re-exported for one release.

Importing this module sets the attribute ``minipaged.paged_attention`` to the module, over the
function of that name (Python binds a submodule on its parent after loading it). So the module
is made callable: ``minipaged.paged_attention(...)`` still runs the function."""

import sys
import types

from minipaged.paged.paged_attention import *  # noqa: F401,F403
from minipaged.paged.paged_attention import paged_attention as _paged_attention


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return _paged_attention(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
