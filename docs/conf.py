"""Sphinx configuration of the cbasr site: MyST Markdown pages, one executed tutorial (myst-nb)
and an API reference from the docstrings. ``make docs`` builds it into ``docs/_build/html``
with warnings as errors."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))  # cbasr_docs: the generated tables
sys.path.insert(0, str(ROOT))

import cbasr  # noqa: E402

project = "cbasr"
author = "the cbasr authors"
copyright = "the cbasr authors, Apache-2.0"
release = version = cbasr.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages (it brings myst_parser) and the executed tutorial
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "cbasr_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}  # .rst first: autosummary's stubs
exclude_patterns = ["_build", "_generated", "_ext", "_templates"]
templates_path = ["_templates"]

html_theme = "furo"
html_title = f"cbasr {release}"
html_static_path: list[str] = []

# MyST: anchors for headings (links like concepts.md#losses), ``{include}`` of the generated parts
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# The tutorial runs at every build, on the CPU, and a failing cell fails the build.
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 600
nb_merge_streams = True

# API reference: a page per public module (autosummary, docs/_templates/autosummary/module.rst),
# its members from the docstrings (Google style, napoleon).
autosummary_generate = True
autosummary_ignore_module_all = True  # every submodule, not only what __all__ re-exports
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "ignore-module-all": True,  # a member is documented once, in the module that defines it
}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields: NamedTuple fields are not documented twice

# Cross-references that do not resolve (a type from torch, a name in prose) are plain text,
# not warnings; every other warning fails the build (make docs: -W --keep-going).
nitpicky = False
