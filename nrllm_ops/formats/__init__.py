"""How the console writes dates and moments (``FORMAT_MODULE_PATH``): one
format, the one its own pages write (``runs.admin.display.moment``), for
what Django's admin formats too."""
