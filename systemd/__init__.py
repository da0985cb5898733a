"""The systemd units, sysusers, tmpfiles and udev rules, as data: the board install script
(``streamfl/deploy/install_board.sh``) installs them from the installed package, so they always
match the code they run."""
