"""The one exception type for mistakes a user can fix; the CLI prints its message as one line."""


class GptLitError(Exception):
    """A problem with the user's input (data file, config, checkpoint, prompt), with what to do about it."""
