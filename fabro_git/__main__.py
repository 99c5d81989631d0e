from fabro_git.cli import entry

entry()
