"""`artmlx bench`: speed and memory, each comparison measured side by side in one process run."""
