"""One way to write a date and a moment across the console (issue #47), in
place of Django's English ones ("Dec. 5, 2026, 2:03 p.m.", "December 2026")
wherever the admin formats a date itself: a date field's column (the daily
spends' day), its date drill-down, a read-only field, an object's history.

ISO-like, to the second and with the zone, as the console's own pages
write a moment (``console.display.moment``): operators compare them with
logs. A day is its date, a month its year and month. The formats a form
reads (``*_INPUT_FORMATS``) stay Django's: they are not set here.
"""

DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
TIME_FORMAT = "H:i:s"
YEAR_MONTH_FORMAT = "Y-m"
# The date drill-down's link to a day: the day's whole date.
MONTH_DAY_FORMAT = "Y-m-d"
