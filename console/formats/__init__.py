"""How the console writes dates and moments (``FORMAT_MODULE_PATH``): one
format, the one its own pages write (``console.display.moment``), for
what Django's admin formats too."""
