"""Makes scripts/ a package, so that tests import its modules as scripts.NAME
(the checkout root on PYTHONPATH); each is also run as a program."""
