"""Status: the snapshot the daemon serves, the Unix-socket API, and the `swarmd status` client and views."""
