def main():
    print("agent")
