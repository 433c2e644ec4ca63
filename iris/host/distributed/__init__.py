"""Between ranks on the host: group helpers, host barriers and timeouts (``helpers``), and
where every rank runs and how it reaches the others (``topology``)."""
