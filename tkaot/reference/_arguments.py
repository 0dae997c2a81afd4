"""The references take their ops' arguments: one signature, the public op's, not a copy of it."""

from __future__ import annotations

import functools
import inspect


def takes_arguments_of(op):
    """Decorator: the reference's parameters are `op`'s of the same names, with op's defaults and annotations.

    The reference's def names the parameters it needs, in the order callers pass them, without
    defaults; a call binds against that signature and fills in op's defaults. A parameter op
    does not have (a reference-only input, such as a given rstd) keeps its own default. op's
    other parameters (output buffers, say) are not taken.
    """
    op_parameters = inspect.signature(op).parameters

    def decorate(reference):
        own = inspect.signature(reference)
        parameters = []
        for name, parameter in own.parameters.items():
            if name not in op_parameters:
                parameters.append(parameter)
            elif parameter.default is not parameter.empty:
                raise TypeError(f"{reference.__qualname__}: the default of {name} is {op.__qualname__}'s")
            else:
                parameters.append(op_parameters[name].replace(kind=parameter.kind))
        signature = own.replace(parameters=parameters)

        @functools.wraps(reference)
        def bound(*args, **kwargs):
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            return reference(*arguments.args, **arguments.kwargs)

        bound.__signature__ = signature
        return bound

    return decorate
