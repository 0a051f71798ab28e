"""artmlx tests. A regular package: some dependencies (cint, via openpipe-art) install a top-level `tests`
package, which would otherwise shadow this folder for `python -m tests....` subprocesses."""
