"""The on-device FedFace client: enroll the owner, take part in rounds, verify locally.

Never imports server_api: a device only knows the server through HTTP.
"""
