"""The one exception type that the command line turns into a one-line message and exit status 2."""


class UserError(Exception):
    """Bad input from the user: a file, a flag, a line of a trace.

    The message must name what is wrong (field, value) and what is allowed. The command line
    prints it as one line without a traceback and exits with status 2.
    """
