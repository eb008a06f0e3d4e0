"""Loading the emulated Metal (tools/metal_emu), built at the path MPS_EXT_METAL_EMU names."""

import importlib.util
import os


def load():
    """The emulation's module (its hooks: fail_next_kernel, released_object_uses). Loading it makes ``mps``
    the emulated GPU for the whole process."""
    import mps_ext  # noqa: F401  (mps_ext._C first: the emulation links with it)

    spec = importlib.util.spec_from_file_location("_metal_emu", os.environ["MPS_EXT_METAL_EMU"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
