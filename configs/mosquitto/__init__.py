"""The shipped broker config and ACL, installed so `streamfl provision` works from the wheel alone."""
