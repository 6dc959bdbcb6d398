"""A Griffe extension for the API reference: public names that share a subpackage's name.

`hfta_nas/__init__.py` binds `train` to the function `hfta_nas.train` after importing the
subpackage of the same name, so at run time `hfta_nas.train` is the function. Griffe reads
the package statically and lets the subpackage win. For every name in a package's
`__all__` that Griffe sees as a submodule while the package imports that name from
elsewhere, this puts the imported object back, as Python does.
"""

from __future__ import annotations

from typing import Any

import griffe


class ShadowedExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        self._restore(pkg, loader)

    def _restore(self, module: griffe.Module, loader: griffe.GriffeLoader) -> None:
        for name in [str(export) for export in module.exports or ()]:
            member = module.members.get(name)
            target = module.imports.get(name)
            if member is None or member.is_alias or not member.is_module or target is None:
                continue
            if target == f"{module.path}.{name}":
                continue  # `from . import name`: the submodule itself
            obj = loader.modules_collection[target]  # resolved before the member is replaced
            module.set_member(name, griffe.Alias(name, obj, parent=module))
        for submodule in list(module.modules.values()):
            if not submodule.is_alias:
                self._restore(submodule, loader)
