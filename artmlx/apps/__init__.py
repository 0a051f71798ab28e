"""The processes: each composition root parses its settings, builds the parts from the libraries
below and runs a loop. `learner` (the learner process and its live view), `actor` (an actor
process), `train` (the synchronous loop of `artmlx train`), `launch` (`artmlx run`: learner and
actors placed and supervised) and `evaluate` (`artmlx eval`). Only the command line (`cli.py`,
`bench/`) imports this package; nothing below it does (tests/test_layout.py).
"""
