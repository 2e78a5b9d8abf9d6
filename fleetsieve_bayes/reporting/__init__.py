"""What people read: the progress display, plots and the HTML report."""
