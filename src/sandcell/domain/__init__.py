"""Pure types of sandcell: states, reasons, limits, errors. No I/O here."""
