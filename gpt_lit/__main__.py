from gpt_lit.run.cli import main

if __name__ == "__main__":
    main()
