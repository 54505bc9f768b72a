"""Throwaway servers (MariaDB, Redis) started as local processes, for the
sample job (`cynomys demo`) and the test suite.  Not for production."""
