"""Account and global notices: the log, acknowledgement, the sources that write it and its delivery."""
