"""Several hosts: the hosts file, remote commands, `artmlx doctor`, `artmlx up/down/logs`, service files."""
