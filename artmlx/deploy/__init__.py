"""Several hosts: the hosts file, remote commands, `artmlx fleet doctor`, `artmlx fleet up/down/logs`, service files."""
