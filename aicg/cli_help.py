"""`doit help <task>` with the task's `name=value` settings (aicg/cli_vars.py).

doit's own help prints a task's first doc line and its `--option` parameters; aicg's settings
are `name=value` variables, which it does not know of. This command is doit's, plus those
lines for a task that declares them in its meta; it is registered under doit's name `help`
(pyproject.toml, entry point doit.COMMAND), and leaves the help of other projects' tasks as
doit prints it.
"""
from __future__ import annotations

from doit.cmd_help import Help as DoitHelp

from . import cli_vars


class Help(DoitHelp):
    name = "help"

    def _execute(self, pos_args):
        if not super()._execute(pos_args):
            return False
        task = next((t for t in self.task_list if t.name == pos_args[0]), None)
        lines = cli_vars.help_lines(getattr(task, "meta", None), pos_args[0].split(":")[0])
        if lines:
            print("\n".join(lines))
        return True
