"""The console's formats for its language, English (``formats``)."""
