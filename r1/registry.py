"""`Registry`: the one kind of table that maps a config's names to code (estimators, losses, rewards, tasks...).

A registry is a dict, so lookups, `in` and listing stay plain; what it adds
is `register(name, obj, replace=False)`, the one way to add an entry, which
refuses a name it already holds unless told to replace it (`table[name] = obj`
goes through it too), and `describe()`, each name's one-line description,
which help texts and errors list instead of names written out by hand.
Stdlib only: config validation imports every registry before torch.
"""
import inspect


class Registry(dict):
    """name -> entry. `what` names the registry in errors; `kind`, if given, is the type every entry has."""

    def __init__(self, what: str, entries: dict | None = None, kind: type | None = None):
        super().__init__()
        self.what, self.kind = what, kind
        for name, obj in (entries or {}).items():
            self.register(name, obj)

    def register(self, name: str, obj, replace: bool = False):
        """Add `obj` under `name` and return it; a name already held (by another object) is a ValueError
        naming the registry and the name, unless replace=True."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.what}: a name must be a non-empty string, got {name!r}")
        if self.kind is not None and not isinstance(obj, self.kind):
            raise TypeError(f"{self.what} {name!r}: expected a {self.kind.__module__}.{self.kind.__name__}, "
                            f"got {type(obj).__name__}")
        if name in self and self[name] is not obj and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered (pass replace=True to replace it)")
        super().__setitem__(name, obj)
        return obj

    def __setitem__(self, name, obj):
        """`table[name] = obj` is `register(name, obj)`: it cannot overwrite an entry silently either."""
        self.register(name, obj)

    def describe(self) -> dict:
        """{name: one-line description}: an entry's `doc`, else the first paragraph of its function's docstring."""
        out = {}
        for name, obj in self.items():
            fn = getattr(obj, "fn", obj)
            doc = getattr(obj, "doc", None) or (fn.__doc__ if inspect.isroutine(fn) else None) or ""
            first = doc.strip().split("\n\n")[0]  # its first paragraph, on one line
            out[name] = " ".join(line.strip() for line in first.splitlines())
        return out
